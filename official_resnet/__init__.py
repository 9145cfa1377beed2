"""ResNet-50 training recipe of Mikami et al. (1811.05233): model, input, LARS, schedules."""
