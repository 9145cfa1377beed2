"""Keeping a job alive or ending it cleanly: the watchdog, and Horovod's elastic API on each stack
(on Horovod's driver, or over a world of fixed size). Imports horovod_api, training and below."""
