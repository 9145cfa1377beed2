"""The launcher's side of a job, standard library only (no TensorFlow, no Horovod): the local
launcher behind `python -m tftorus.run` (tftorus/run.py) and what a launcher gives each rank
(horovodrun's HOROVOD_* variables from the hosts' rank layout). Bottom room: imports no other
part of tftorus, so launching costs no TensorFlow start-up."""
