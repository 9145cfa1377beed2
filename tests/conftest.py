"""The test tiers, and TensorFlow's `test_session` kept out of the count.

`bash run_scripts/test.sh` runs the default tier; `--slow` runs the slow tier (the heaviest
multi-process jobs, each the bigger sibling of a check the default tier makes too); `--all`
runs both; `--quick` runs the default tier's tests that start no process (the inner loop). CI
(.ci/run) runs `--ci`: both tiers but WIDER, the slow tests' bigger siblings. A test is slow
by being listed in SLOW, with its time on the 2-core CI machine, and launches by being (or
being in a class) listed in LAUNCHES, so the tiers can be read in one place. In the quick tier
tests/harness.py refuses to start a process, so a test that launches but is not listed fails
there, naming this file.

Two stacks run the suite (TFTORUS_STACK in run_scripts/test.sh): classic (TensorFlow 2.15 with
Horovod) runs every test but CURRENT_ONLY's; current (TensorFlow 2.21, Keras 3, no Horovod) runs
only what CURRENT_STACK lists, in the same tiers. A stack without Horovod is the current one.
CURRENT_ONLY holds the tf engine's heaviest jobs: the engine is the same code on both stacks, and
they run once, on the stack where it is the only engine; and the slow tier's jobs whose code is
the same on both stacks (a lighter sibling of each runs on both).
"""
import importlib.util
import os
import time

import pytest
import tensorflow as tf

# tf.test.TestCase has a method named test_session (a context manager, not a test) that pytest
# would collect and report as skipped in every TestCase class; pytest skips what says
# __test__ = False.
tf.test.TestCase.test_session.__test__ = False

# node id -> its seconds in a CI run on 2 cores (2026-11-23; the widest worlds in .ci/run on
# 2026-11-26); the comments say which lighter check of the same kind the default tier keeps
SLOW = {
    # Ray clusters of three nodes, each job three worlds (the default tier keeps
    # test_ray.py::ExecutorTest); alone, 2026-12-03, the main job at 263 images/s
    "tests/test_ray.py::ElasticTest::test_keras_fit_loses_a_node_then_grows": 55,
    "tests/test_ray.py::ElasticTest::test_ray_train_keras_fit_loses_a_node_then_grows": 139,
    # the main job on Ray (RecipeOnRaySmallDataTest, 151 s at 125 images/s, stays)
    "tests/test_ray.py::RecipeOnRayTest::test_a_lost_node_mid_run": 290,
    # the attacked job on Horovod's engine (2026-12-02, the main job at 141 images/s): the tf
    # engine's stays
    "tests/test_job_secret.py::AttackedJobTest::test_horovod_engine": 144,
    # the default tier keeps the lighter sibling named in each comment
    "tests/test_overlap.py::OverlapTest::test_tf_engine": 49,  # test_horovod_engine
    # the launcher's commands and refusals: LauncherCommandTest and the wrong-count test
    "tests/test_paper_scale.py::PerPhaseWorkersTest::"
    "test_launcher_runs_each_phase_on_its_own_count": 53,
    # a refused resume: ConfigMismatchScriptTest (train.py refusing another configuration)
    "tests/test_resume.py::ResumeRunsTest::test_new_world_size_inside_a_phase_is_refused": 32,
    # Horovod's collectives on 4 and 3 ranks (tests/workers/horovod_collectives_check.py): 2 ranks
    # (3 ranks: 77 s on current, 2026-12-02, the main job at 141 images/s)
    "tests/test_horovod_collectives.py::CollectivesOnWorldsTest::test_four_ranks": 47,
    "tests/test_horovod_collectives.py::CollectivesOnWorldsTest::test_three_ranks": 77,
    # lost peers on the tf engine: KilledWorkerTest::test_killed_mid_collective
    "tests/test_tf_engine.py::KilledWorkerTest::test_dead_before_collective_times_out": 23,
    "tests/test_peer_health.py::RealPeersTest::"
    "test_a_stopped_peer_ends_the_others_within_the_timeout": 22,
    # the widest worlds; 1, 2 and 4 ranks (and 2 and 4 on the tf engine) stay in the default tier;
    # 8 (Horovod's engine) and 12 (the tf engine) check only the grids with both a row and a
    # column phase (--light), which have rows and columns of 2 and 4, and of 2, 3, 4 and 6 ranks
    "tests/test_allreduce_multiprocess.py::AllreduceMultiprocessTest::test_six_ranks": 41,
    "tests/test_allreduce_multiprocess.py::AllreduceMultiprocessTest::test_eight_ranks": 60,
    "tests/test_tf_engine.py::TFEngineJobsTest::test_twelve_ranks_task_name_order": 75,
    # a worker lost: KilledWorkerTest (SIGKILL on the tf engine) stays in the default tier, and
    # a normal finish is checked there by test_paper_scale's launcher test
    "tests/test_worker_loss.py::WorkerLossTest::test_stopped_worker_horovod_engine": 49,
    "tests/test_worker_loss.py::WorkerLossTest::test_killed_worker_tf_engine": 44,
    "tests/test_worker_loss.py::WorkerLossTest::test_stopped_worker_tf_engine": 44,
    # the SIGKILLed job above (one launch for both tests) resumed, and an uninterrupted run:
    # 2 runs of Exp. 2 on 4 ranks (measured on classic under load; the current stack took 119)
    "tests/test_worker_loss.py::WorkerLossTest::"
    "test_killed_worker_tf_engine_then_resume_equals_uninterrupted": 53,
    # elastic: one job (shared by both tests) that loses a worker and gains one; the killed
    # worker on a fixed world stays in the default tier (test_worker_loss)
    "tests/test_elastic.py::ElasticJobTest::"
    "test_four_then_three_on_a_grid_named_in_the_log_then_four": 50,
    "tests/test_elastic.py::ElasticJobTest::"
    "test_every_step_committed_once_and_weights_equal_a_float64_replay": 1,
    # resume (its stopped run shared with the refused resume above; the world size changed at a
    # phase boundary: the launcher test, tests/test_paper_scale.py)
    "tests/test_resume.py::ResumeRunsTest::test_stop_and_resume_equals_uninterrupted": 77,
    # every bad input, library-level and train.py's; test_train_script's bad-input test and
    # test_bad_input_surface's saved-run test stay in the default tier
    "tests/test_bad_input.py::BadInputTest::test_every_bad_input_fails_clearly": 82,
    "tests/test_bad_input_surface.py::BadInputSurfaceTest::"
    "test_every_case_fails_clearly_and_keeps_what_was_there": 72,
    # three experiments end to end through train.py (ref, 1, 4, one process each); Exp. 2 and 3
    # on 2 workers and mixed precision stay in the default tier
    "tests/test_train_script.py::TrainScriptTest::"
    "test_experiments_ref_1_and_4_end_to_end_with_tensorboard": 77,
    # the tf engine without Horovod; the Horovod engine's equivalence tests stay
    "tests/test_training_equivalence.py::TrainingEquivalenceTest::"
    "test_tf_engine_fit_without_horovod_and_engines_agree": 49,
    # (2026-11-26, to keep the default tier of both stacks near 10 minutes; seconds on classic /
    # current) train.py on 2 workers: test_tf_engine_trains_on_tf_config_workers stays; mixed
    # precision's step stays in test_nonfinite and test_train_step, a refused configuration
    # in ConfigMismatchScriptTest
    "tests/test_train_script.py::TrainScriptTest::"
    "test_exp3_on_two_workers_switches_batch_and_momentum": 31,  # 28
    "tests/test_train_script.py::TrainScriptTest::"
    "test_mixed_precision_uses_the_loss_scale_and_resumes": 33,  # 17
    "tests/test_train_script.py::TrainScriptTest::test_bad_input_is_a_clear_error": 20,  # 22
    "tests/test_train_script.py::TrainScriptTest::"
    "test_world_size_the_experiment_cannot_map": 10,  # 11
    # a user's fit on the tf engine: TF_CONFIG and the local launcher stay; the srun and mpirun
    # variables stay as SchedulerEnvironmentTest's launches of the discovery alone
    "tests/test_user_fit.py::LaunchWithoutHorovodTest::test_slurm_srun_environment": 8,  # 13
    "tests/test_user_fit.py::LaunchWithoutHorovodTest::test_open_mpi_mpirun_environment": 8,  # 13
    # SIGKILL on the Horovod engine: KilledWorkerTest (tf engine) stays
    "tests/test_worker_loss.py::WorkerLossTest::test_killed_worker_horovod_engine": 34,
    # plan mode: every experiment at the paper's GPU counts stays
    "tests/test_paper_scale.py::PlanModeTest::test_the_issues_commands": 11,
    # the tf engine's four-rank world (classic: one horovodrun launch both tests share; current:
    # TF_CONFIG): the two-rank jobs and KilledWorkerTest's four ranks stay
    "tests/test_tf_engine.py::TFEngineJobsTest::test_four_ranks_horovodrun_rendezvous": 49,
    "tests/test_training_equivalence.py::TrainingEquivalenceTest::"
    "test_tf_engine_tape_under_horovodrun": 1,
    "tests/test_tf_engine.py::TFEngineJobsTest::test_four_ranks_tf_config": 21,  # current
}


# The slow tier's bigger siblings, each -> the lighter check of the same code CI keeps: a wider
# world, the same check on the other engine, or every case of a list CI samples. CI
# (`run_scripts/test.sh --ci`, .ci/run) leaves them out, to stay within 35 minutes on 2 cores
# (2026-12-02: 7.6 of its minutes; the three added 2026-12-03 about 3.4 more: their times in a
# fresh clone's .ci/run at 238 images/s, less the runs they shared with tests CI keeps); `--all`
# and `--slow` run them. Run `--all` before changing
# what they cover (the torus schedule, the tf engine's groups, bad-input messages, the
# launchers' discovery, lost peers).
WIDER = {
    "tests/test_allreduce_multiprocess.py::AllreduceMultiprocessTest::test_six_ranks":
        "every grid of 4 ranks (test_four_ranks, 2 x 2 with a row and a column phase)",
    "tests/test_allreduce_multiprocess.py::AllreduceMultiprocessTest::test_eight_ranks":
        "every grid of 4 ranks (test_four_ranks, 2 x 2 with a row and a column phase); the "
        "schedule's code is the same for any row length (test_grid, the simulator's tests)",
    "tests/test_tf_engine.py::TFEngineJobsTest::test_twelve_ranks_task_name_order":
        "TensorFlow's member order of 10+ tasks (test_tf_engine's tf_member_order unit test); "
        "the 2- and 4-rank tf engine jobs (the torus schedule is the same code for any world)",
    "tests/test_horovod_collectives.py::CollectivesOnWorldsTest::test_four_ranks":
        "the same checks on 2 ranks",
    "tests/test_horovod_collectives.py::CollectivesOnWorldsTest::test_three_ranks":
        "the same checks on 2 ranks; an odd world in test_launchers' and test_sync_batch_norm's "
        "3-rank jobs",
    "tests/test_worker_loss.py::WorkerLossTest::"
    "test_killed_worker_tf_engine_then_resume_equals_uninterrupted":
        "test_resume's stopped run resumed equal to an uninterrupted one; the killed worker's "
        "own test (its checkpoint and the job's end)",
    "tests/test_paper_scale.py::PerPhaseWorkersTest::"
    "test_launcher_runs_each_phase_on_its_own_count":
        "LauncherCommandTest's per-phase commands; test_a_direct_launch_on_the_wrong_count",
    "tests/test_bad_input.py::BadInputTest::test_every_bad_input_fails_clearly":
        "test_bad_arguments_fail_where_they_are_given; train.py's bad input",
    "tests/test_bad_input_surface.py::BadInputSurfaceTest::"
    "test_every_case_fails_clearly_and_keeps_what_was_there":
        "test_a_saved_run_keeps_every_byte",
    "tests/test_train_script.py::TrainScriptTest::"
    "test_experiments_ref_1_and_4_end_to_end_with_tensorboard":
        "Exp. 2 and 3 end to end (with TensorBoard's scalars); every experiment's plan",
    "tests/test_user_fit.py::LaunchWithoutHorovodTest::test_slurm_srun_environment":
        "SchedulerEnvironmentTest's launches from srun's variables; a user's fit under TF_CONFIG",
    "tests/test_user_fit.py::LaunchWithoutHorovodTest::test_open_mpi_mpirun_environment":
        "SchedulerEnvironmentTest's launches from mpirun's variables; a user's fit under "
        "TF_CONFIG",
    "tests/test_peer_health.py::RealPeersTest::"
    "test_a_stopped_peer_ends_the_others_within_the_timeout":
        "test_worker_loss' stopped worker on the tf engine (the same heartbeats, in a job)",
    "tests/test_worker_loss.py::WorkerLossTest::test_killed_worker_horovod_engine":
        "the stopped worker on Horovod's engine; the killed worker on the tf engine",
    "tests/test_paper_scale.py::PlanModeTest::test_the_issues_commands":
        "test_every_experiment_at_the_papers_gpu_counts",
    "tests/test_ray.py::RecipeOnRayTest::test_a_lost_node_mid_run":
        "RecipeOnRaySmallDataTest: the same driver, worlds and resume on a tenth of the data "
        "(the top-1 band after the loss is this test's alone)",
    "tests/test_ray.py::ElasticTest::test_ray_train_keras_fit_loses_a_node_then_grows":
        "test_keras_fit_loses_a_node_then_grows: the same user's fit, hvd.elastic states and "
        "commits, node loss and growth under RayExecutor (Ray Train's keeper, "
        "tftorus/on_ray/ray_train_keeper.py, is this test's alone: run --all when it or Ray "
        "changes)",
    "tests/test_worker_loss.py::WorkerLossTest::test_killed_worker_tf_engine":
        "the stopped worker on the tf engine (the same train.py job and watchdog, the lost rank "
        "named on every survivor); KilledWorkerTest (SIGKILL mid-collective on the tf engine)",
    "tests/test_resume.py::ResumeRunsTest::test_new_world_size_inside_a_phase_is_refused":
        "CheckpointFilesTest::test_a_new_world_size_only_at_a_phase_boundary (check_world, in "
        "one process); ConfigMismatchScriptTest (train.py refusing before it restores)",
    "tests/test_job_secret.py::AttackedJobTest::test_horovod_engine":
        "the tf engine's attacked job (the same watchdog, sealed with the same secret; current "
        "stack) and WatchdogUnderAttackTest on both stacks",
}

# test classes (or single tests) that start processes: worlds under horovodrun, TF_CONFIG
# processes, run_scripts/*.py end to end, or one `python -c`
LAUNCHES = (
    "tests/test_shared_memory.py::TwoHostsJobTest",
    "tests/test_ray.py::ExecutorTest",
    "tests/test_ray.py::ElasticTest",
    "tests/test_ray.py::RecipeOnRayTest",
    "tests/test_ray.py::RecipeOnRaySmallDataTest",
    "tests/test_elastic.py::ElasticJobTest",
    "tests/test_elastic.py::GlobalSetCollectivesTest",
    "tests/test_allreduce_multiprocess.py::AllreduceMultiprocessTest",
    "tests/test_api.py::ApiTest::test_the_package_needs_no_study_dependency",
    "tests/test_bad_input.py::BadInputTest",
    "tests/test_bad_input_surface.py::BadInputSurfaceTest",
    "tests/test_callbacks.py::BatchSizeControlFitTest",
    "tests/test_user_fit.py::HorovodLaunchTest",
    "tests/test_user_fit.py::LaunchWithoutHorovodTest",
    "tests/test_emulated_cluster.py::EmulatedClusterTest",
    "tests/test_horovod_semantics.py::HorovodSemanticsTest",
    "tests/test_launchers.py::LocalLauncherTest",
    "tests/test_launchers.py::SchedulerEnvironmentTest",
    "tests/test_facades_without_horovod.py::FacadesOnTwoWorkersTest",
    "tests/test_horovod_collectives.py::CollectivesOnWorldsTest",
    "tests/test_sync_batch_norm.py::SyncBatchNormTest::test_two_ranks_match_the_whole_batch",
    "tests/test_sync_batch_norm.py::SyncBatchNormTest::test_three_ranks_match_the_whole_batch",
    "tests/test_execution_modes.py::ExecutionModesTest",
    "tests/test_keras3_optimizer.py::BackwardPassesOnTwoWorkersTest",
    "tests/test_nonfinite.py::SkipOnEveryWorkerTest",
    "tests/test_overlap.py::OverlapTest",
    "tests/test_paper_scale.py::PlanModeTest",
    "tests/test_paper_scale.py::CardCommandTest",
    "tests/test_paper_scale.py::PerPhaseWorkersTest",
    "tests/test_resume.py::ResumeRunsTest",
    "tests/test_resume.py::ConfigMismatchScriptTest",
    "tests/test_tf_engine.py::TFEngineJobsTest",
    "tests/test_tf_engine.py::KilledWorkerTest",
    "tests/test_peer_health.py::RealPeersTest",
    "tests/test_planner.py::ProbeJobTest",
    "tests/test_plan_guard.py::GuardJobTest",
    "tests/test_plan_guard.py::StalledProbeJobTest",
    "tests/test_job_secret.py::AttackedJobTest",
    "tests/test_train_script.py::TrainScriptTest",
    "tests/test_training_equivalence.py::TrainingEquivalenceTest",
    "tests/test_worker_loss.py::TerminateHookTest",
    "tests/test_worker_loss.py::WorkerLossTest",
    "tests/test_virtual_accelerator.py::OnTwoWorkersTest",
    "tests/test_simulated_step.py::QuotedStepsTest",
    "tests/test_mixed_precision.py::MixedPrecisionOverflowTest",
    "tests/test_gpu_per_process.py::GpuCheckScriptTest",
    "tests/test_multi_node_launcher.py::AcrossHostsTest",
    "tests/test_packaging.py::WheelTest",
)


# Tests that start no process but time themselves against the clock (real heartbeats of 1-3 s,
# a rendezvous's bound, the CPU a step leaves idle): run_scripts/test.sh runs them in the lane of
# the tests that launch, never beside a launch.
ALONE = (
    "tests/test_worker_loss.py::VerdictTest",
    "tests/test_job_secret.py::WatchdogUnderAttackTest",
    "tests/test_launchers.py::RendezvousTest",
    "tests/test_peer_health.py::VerdictTest",
    "tests/test_virtual_accelerator.py::TrainStepTest",
)

# The tests the current stack runs: test files, or classes (or single tests) in them. There a
# file not listed is not collected at all, so its module-level `import horovod` never runs, and
# the tests of a listed class's file outside that class are deselected. The list grows as more
# of the package works without Horovod.
CURRENT_STACK = (
    "tests/test_ray.py",
    "tests/test_doc_links.py",
    "tests/test_grid.py",
    "tests/test_fusion.py",
    "tests/test_cost_model.py",
    "tests/test_planner.py",
    "tests/test_plan_guard.py",
    "tests/test_job_secret.py",
    "tests/test_launchers.py",
    "tests/test_keras3_optimizer.py",
    "tests/test_keras3_callbacks.py",
    "tests/test_mixed_precision.py",
    "tests/test_gpu_per_process.py",
    "tests/test_multi_node_launcher.py",
    "tests/test_packaging.py",
    "tests/test_facades_without_horovod.py",
    "tests/test_execution_modes.py",
    "tests/test_user_fit.py::LaunchWithoutHorovodTest",
    "tests/test_tf_engine.py",
    "tests/test_shared_memory.py",
    "tests/test_peer_health.py",
    "tests/test_input_pipeline.py",
    "tests/test_lars.py",
    "tests/test_emulated_step.py",
    "tests/test_gradient_readiness.py",
    "tests/test_virtual_accelerator.py",
    "tests/test_train_step.py",
    "tests/test_nonfinite.py",
    "tests/test_bn_statistics.py",
    "tests/test_callbacks.py",
    "tests/test_trainer.py",
    "tests/test_official_resnet_layout.py",
    "tests/test_tftorus_layout.py",
    "tests/test_train_script.py",
    "tests/test_resume.py",
    "tests/test_schedules.py",
    "tests/test_batch_plan.py",
    "tests/test_resnet_model.py",
    "tests/test_bad_input.py",
    "tests/test_fused_batch_norm.py",
    "tests/test_sync_batch_norm.py",
    "tests/test_horovod_collectives.py",
    "tests/test_horovod_compatibility.py",
    "tests/test_worker_loss.py::VerdictTest",
    "tests/test_worker_loss.py::WorkerLossTest::test_killed_worker_tf_engine",
    "tests/test_worker_loss.py::WorkerLossTest::test_stopped_worker_tf_engine",
    "tests/test_worker_loss.py::WorkerLossTest::"
    "test_killed_worker_tf_engine_then_resume_equals_uninterrupted",
    "tests/test_paper_scale.py::LauncherCommandTest",
    "tests/test_paper_scale.py::PerPhaseWorkersTest",
)

# Run on the current stack only (see the module docstring); the classic stack's tf engine keeps
# its 1-, 2- and 4-rank jobs, KilledWorkerTest, the engines' agreement in a fit and a user's fit
# under the local launcher and TF_CONFIG.
CURRENT_ONLY = (
    "tests/test_planner.py::ProbeJobTest::test_tf_engine_two_hosts_probe_plan_and_sum",
    "tests/test_plan_guard.py::GuardJobTest::test_tf_engine",
    "tests/test_job_secret.py::AttackedJobTest::test_tf_engine",
    "tests/test_job_secret.py::AttackedJobTest::"
    "test_a_rank_without_the_secret_stops_the_job_in_one_line",
    "tests/test_resume.py::ResumeRunsTest::"
    "test_ranks_that_see_different_model_dirs_stop_before_restoring",
    "tests/test_tf_engine.py::TFEngineJobsTest::test_twelve_ranks_task_name_order",
    "tests/test_shared_memory.py::TwoHostsJobTest",
    "tests/test_mixed_precision.py::MixedPrecisionOverflowTest::test_four_ranks",
    "tests/test_gpu_per_process.py::GpuCheckScriptTest",
    "tests/test_multi_node_launcher.py::AcrossHostsTest",
    "tests/test_packaging.py::WheelTest",
    "tests/test_worker_loss.py::WorkerLossTest::test_killed_worker_tf_engine",
    "tests/test_worker_loss.py::WorkerLossTest::test_stopped_worker_tf_engine",
    "tests/test_worker_loss.py::WorkerLossTest::"
    "test_killed_worker_tf_engine_then_resume_equals_uninterrupted",
    # the launchers' discovery from srun's and mpirun's variables is plain Python, the same on
    # both stacks; the classic stack keeps the local launcher and TF_CONFIG
    "tests/test_launchers.py::SchedulerEnvironmentTest",
    "tests/test_user_fit.py::LaunchWithoutHorovodTest::test_slurm_srun_environment",
    "tests/test_user_fit.py::LaunchWithoutHorovodTest::test_open_mpi_mpirun_environment",
    # The slow tier's jobs whose code is the same on both stacks, each with a lighter sibling in
    # the default tier on both (2026-12-02: 3.5 min of the classic stack's 26 in CI): the
    # launcher per phase (LauncherCommandTest), a refused world size and a world the experiment
    # cannot map (plain Python in the trainer; ConfigMismatchScriptTest), the tf engine's lost
    # peers (KilledWorkerTest::test_killed_mid_collective), train.py's experiments end to end and
    # its bad input (test_tf_engine_trains_on_tf_config_workers, test_bad_input.py). What Keras 2
    # and 3 do differently (resume, mixed precision, the momentum switch) stays on both.
    "tests/test_paper_scale.py::PerPhaseWorkersTest::"
    "test_launcher_runs_each_phase_on_its_own_count",
    "tests/test_resume.py::ResumeRunsTest::test_new_world_size_inside_a_phase_is_refused",
    "tests/test_tf_engine.py::KilledWorkerTest::test_dead_before_collective_times_out",
    "tests/test_peer_health.py::RealPeersTest::"
    "test_a_stopped_peer_ends_the_others_within_the_timeout",
    "tests/test_train_script.py::TrainScriptTest::"
    "test_experiments_ref_1_and_4_end_to_end_with_tensorboard",
    "tests/test_train_script.py::TrainScriptTest::test_bad_input_is_a_clear_error",
    "tests/test_train_script.py::TrainScriptTest::test_world_size_the_experiment_cannot_map",
)

CURRENT = importlib.util.find_spec("horovod") is None  # this is the current stack


def _under(nodeid: str, entry: str) -> bool:
    """The test `nodeid` is `entry` or in it (a class)."""
    return (nodeid + "::").startswith(entry + "::")


def launches(nodeid: str) -> bool:
    return any(_under(nodeid, entry) for entry in LAUNCHES)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: the slow tier (bash run_scripts/test.sh --slow)")
    config.addinivalue_line("markers", "wider: a slow test's bigger sibling, not in CI (WIDER)")
    not_slow = set(WIDER) - set(SLOW)
    if not_slow:
        raise pytest.UsageError(f"tests/conftest.py: WIDER lists tests SLOW does not: "
                                f"{sorted(not_slow)}")
    config.addinivalue_line("markers", "launches: starts processes; not in the quick tier")
    config.addinivalue_line("markers", "alone: times itself; never beside a launch (ALONE)")


def pytest_ignore_collect(collection_path, config):
    """On the current stack, a test file CURRENT_STACK does not list is not even imported."""
    if not CURRENT or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    try:
        path = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    return True if path not in {e.split("::")[0] for e in CURRENT_STACK} else None


@pytest.hookimpl(tryfirst=True)  # before -m selects by the marks added here
def pytest_collection_modifyitems(session, config, items):
    if CURRENT:
        keep = [i for i in items if any(_under(i.nodeid, e) for e in CURRENT_STACK)]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in keep])
            items[:] = keep
        # a run that tests nothing is a failure (with collection errors pytest reports those)
        if not items and not session.testsfailed:
            raise pytest.UsageError(
                "the current stack (no Horovod) collected no test: it runs only what "
                f"tests/conftest.py's CURRENT_STACK lists: {', '.join(CURRENT_STACK)}")
        unknown = {e for e in CURRENT_STACK if not any(_under(i.nodeid, e) for i in items)}
        if unknown and not session.testsfailed \
                and [a.rstrip("/") for a in config.args] == ["tests"]:
            raise pytest.UsageError(f"tests/conftest.py's CURRENT_STACK lists tests that do not "
                                    f"exist: {sorted(unknown)}")
    else:
        only_current = [i for i in items if any(_under(i.nodeid, e) for e in CURRENT_ONLY)]
        if only_current:
            config.hook.pytest_deselected(items=only_current)
            items[:] = [i for i in items if i not in only_current]
    for item in items:
        if item.nodeid in SLOW:
            item.add_marker(pytest.mark.slow)
        if item.nodeid in WIDER:
            item.add_marker(pytest.mark.wider)
        if launches(item.nodeid):
            item.add_marker(pytest.mark.launches)
        if any(_under(item.nodeid, entry) for entry in ALONE):
            item.add_marker(pytest.mark.alone)
    unknown = set(SLOW) - set(CURRENT_ONLY) - {item.nodeid for item in items}
    unknown |= {e for e in LAUNCHES + ALONE if not any(_under(item.nodeid, e) for item in items)
                and not any(_under(e, c) for c in CURRENT_ONLY)}
    if unknown and [a.rstrip("/") for a in config.args] == ["tests"] \
            and not CURRENT:  # a renamed test (the current stack collects only some)
        raise pytest.UsageError(f"tests/conftest.py lists tests that do not exist: "
                                f"{sorted(unknown)}")


# How much of each test's time left the cores idle (the machine's /proc/stat, all processes):
# a test that mostly waits (a timeout, a peer's loss) can share the cores with another one; a
# test that keeps them busy cannot. The summary lists the tests that left the most idle.
_IDLE = {}


def _idle_core_seconds():
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        return (int(fields[3]) + int(fields[4])) / os.sysconf("SC_CLK_TCK")  # idle + iowait
    except (OSError, ValueError, IndexError):
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    idle, start = _idle_core_seconds(), time.monotonic()
    yield
    if idle is not None:
        _IDLE[item.nodeid] = (time.monotonic() - start, _idle_core_seconds() - idle)


def pytest_terminal_summary(terminalreporter):
    if not _IDLE:
        return
    cores = os.cpu_count() or 1
    wall = sum(w for w, _ in _IDLE.values())
    idle = sum(i for _, i in _IDLE.values())
    terminalreporter.write_sep("=", f"idle cores: {idle / cores / 60:.1f} of {wall / 60:.1f} "
                                    f"min of tests ({cores} cores)")
    for nodeid, (w, i) in sorted(_IDLE.items(), key=lambda kv: -kv[1][1])[:25]:
        if i / cores >= 1:
            terminalreporter.write_line(f"{i / cores:7.1f}s idle of {w:7.1f}s  {nodeid}")
