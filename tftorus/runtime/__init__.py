"""The process at run time: which stack it runs on (stack), its state after init (process_state:
the engine's communicator, the grids, the links and the plan), the fused, checked all-reduce a
training step's gradients go through (reduction), the step's gradient clocks for the planner
(gradient_readiness), and rank/size/barrier/broadcast for either engine (world). Imports
torus, launch, cluster, engines and planning."""
