"""Issue 18: the facades export what __all__ lists and take the torus options as one
TorusOptions or by name. Issue 30: they have every public name of Horovod's modules (elastic
included), so Horovod's own test suites run on them."""
import inspect
import subprocess
import sys

import tensorflow as tf

import tftorus
import tftorus.keras
from tftorus.runtime.reduction import TorusOptions


def horovod_public_names(module):
    """The names `from module import *` gives (Horovod has no __all__), less the libraries it
    imports for itself (os, tf, keras, packaging's version, ...)."""
    return {name for name in dir(module) if not name.startswith("_")
            and not (inspect.ismodule(getattr(module, name))
                     and not getattr(module, name).__name__.startswith("horovod"))}


class ApiTest(tf.test.TestCase):

    def test_every_exported_name_exists(self):
        for module in (tftorus, tftorus.keras):
            with self.subTest(module=module.__name__):
                self.assertEqual(len(module.__all__), len(set(module.__all__)))
                for name in module.__all__:
                    self.assertTrue(hasattr(module, name), name)

    def test_every_public_horovod_name_is_on_the_facade(self):
        """What `hvd.` reaches on Horovod's modules is there on ours (Horovod's own test suites
        call rank_op(), util._executing_eagerly() and such): Horovod's object itself, except
        where it would reduce gradients or start Horovod without the torus' process sets."""
        import horovod.tensorflow as hvd_tf
        import horovod.tensorflow.keras as hvd_keras
        ours = {"init", "shutdown", "DistributedOptimizer", "DistributedGradientTape",
                "PartialDistributedGradientTape", "load_model", "Compression",
                "compression", "keras", "elastic"}  # the last three: tftorus' submodules
        for module, horovods in ((tftorus, hvd_tf), (tftorus.keras, hvd_keras)):
            reached = {"_executing_eagerly"} & set(dir(horovods))  # by Horovod's test suite
            for name in horovod_public_names(horovods) | reached:
                with self.subTest(module=module.__name__, name=name):
                    found = getattr(module, name)
                    if name in ours:
                        owner = found.__name__ if inspect.ismodule(found) else found.__module__
                        self.assertTrue(owner.startswith("tftorus"), owner)
                    else:
                        self.assertIs(found, getattr(horovods, name))
                    if not name.startswith("_") and not (name in ours and inspect.ismodule(found)):
                        self.assertIn(name, module.__all__)  # as `from horovod... import *`
        self.assertTrue(tftorus.util._executing_eagerly())  # eager by default in TF 2

    def test_ours_where_horovods_would_bypass_the_torus(self):
        self.assertEqual(tftorus.PartialDistributedGradientTape.__module__, "tftorus.training.optimizer_horovod")
        for module in (tftorus, tftorus.keras):
            self.assertTrue(module.DistributedOptimizer.__module__.startswith("tftorus"))
        self.assertIs(tftorus.keras.TorusOptions, tftorus.TorusOptions)

    def test_elastic_is_horovods_api_with_a_torus_reset(self):
        """hvd.elastic has Horovod's names on both facades; run() and the Keras states are
        ours (the world re-forms the torus, the model's traced step is dropped), the rest
        Horovod's (tests/test_elastic.py runs them on a real elastic job)."""
        import horovod.tensorflow.elastic as hvd_elastic
        import horovod.tensorflow.keras.elastic as hvd_keras_elastic

        import tftorus.keras.elastic  # noqa: F401  importable as Horovod's is
        for ours, horovods in ((tftorus.elastic, hvd_elastic),
                               (tftorus.keras.elastic, hvd_keras_elastic)):
            for name in horovods.__all__:
                with self.subTest(module=ours.__name__, name=name):
                    found = getattr(ours, name)
                    if name in ("run", "TensorFlowKerasState", "KerasState"):
                        self.assertTrue(found.__module__.startswith("tftorus"))
                        if inspect.isclass(found):
                            self.assertTrue(issubclass(found, hvd_elastic.TensorFlowKerasState))
                    else:
                        self.assertIs(found, getattr(horovods, name))
        self.assertIs(tftorus.keras.elastic.run, tftorus.elastic.run)
        with self.assertRaisesRegex(AttributeError, "no attribute 'no_such_name'"):
            tftorus.no_such_name  # noqa: B018

    def test_torus_options_by_name_or_as_one(self):
        kwargs = {"algorithm": "ring", "grid": "2x2", "name": "x"}
        self.assertEqual(TorusOptions.pop_from(kwargs), TorusOptions("ring", "2x2"))
        self.assertEqual(kwargs, {"name": "x"})  # Horovod's arguments stay
        options = TorusOptions(fusion_threshold_bytes=0)
        self.assertIs(TorusOptions.pop_from({"torus_options": options}), options)
        with self.assertRaisesRegex(TypeError, "not both"):
            TorusOptions.pop_from({"torus_options": options, "grid": "2x2"})
        with self.assertRaisesRegex(ValueError, "algorithm"):
            TorusOptions.pop_from({"algorithm": "tree"})

    def test_both_optimizer_facades_refuse_a_name(self):
        for module in (tftorus, tftorus.keras):
            with self.assertRaisesRegex(TypeError, "wraps an optimizer instance"):
                module.DistributedOptimizer("sgd")


    def test_a_horovod_whose_seam_differs_is_refused_by_name(self):
        from unittest import mock

        import horovod.tensorflow as hvd_tf

        from tftorus.training import optimizer_horovod as optimizer
        optimizer.check_seam()  # the installed Horovod's seam is the one we hook
        with mock.patch.object(hvd_tf, "_make_allreduce_grads_fn",
                               lambda name, compression, op: None):
            with self.assertRaisesRegex(ImportError, r"as in Horovod 0\.28\.1; this Horovod "
                                                     r"\(.*\) has \('name', 'compression', "
                                                     r"'op'\): install horovod==0\.28\.1"):
                with optimizer.torus_gradient_reduction(TorusOptions()):  # every wrapper's
                    pass

    def test_the_package_needs_no_study_dependency(self):
        """scipy (the cost model's fit) is a study's dependency: with it unimportable, the
        package and its plan mode's cost model still import. (TensorFlow itself imports scipy
        when it is installed, so the check blocks it rather than looking for it.)"""
        code = (
            "import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in ('scipy', 'matplotlib', 'sklearn'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import tftorus, tftorus.keras, tftorus.planning.cost_model, official_resnet.plan.run_plan\n"
            "print('imported')\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=120)
        self.assertIn("imported", result.stdout, result.stderr[-2000:])


if __name__ == "__main__":
    tf.test.main()
