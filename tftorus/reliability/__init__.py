"""Keeping a job alive or ending it cleanly: the watchdog (UDP heartbeats that name a lost or
stalled rank) and Horovod's elastic API on each stack: elastic_on_horovod (classic, the world
re-formed by Horovod's driver) and elastic_fixed_size (current, a world that keeps its size),
each with its Keras states and callbacks. Imports horovod_api, training and the rooms below."""
