"""RecipeModel's step: k micro-batches per update give the update of one batch k times the size,
and the number of micro-batches per update is read from a variable (no retrace to change it)."""
import numpy as np
import tensorflow as tf

from official_resnet.model.recipe_model import RecipeModel


def model_and_optimizer():
    tf.keras.utils.set_random_seed(3)
    net = tf.keras.Sequential([tf.keras.Input((6,)),
                               tf.keras.layers.Dense(8, activation="tanh"),
                               tf.keras.layers.Dense(4)])
    model = RecipeModel.wrap(net, label_smoothing=0.1)
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.5, momentum=0.9))
    return model


class RecipeModelStepTest(tf.test.TestCase):

    def test_accumulation_equals_one_big_batch(self):
        rng = np.random.RandomState(0)
        images = rng.standard_normal((16, 6)).astype(np.float32)
        labels = rng.randint(0, 4, 16)
        weights = {}
        for k in (1, 2, 4):
            model = model_and_optimizer()
            model.accumulation.assign(k)
            micro = tf.data.Dataset.from_tensor_slices((images, labels)).batch(16 // k).repeat()
            model.fit(micro, epochs=1, steps_per_epoch=3 * k, verbose=0)
            self.assertEqual(int(model.updates.numpy()), 3)
            self.assertEqual(int(model.optimizer.iterations.numpy()), 3)
            self.assertTrue(bool(model.last_applied.numpy()))
            self.assertTrue(np.isfinite(float(model.last_loss.numpy())))
            weights[k] = [v.numpy() for v in model.trainable_variables]
        for k in (2, 4):
            for a, b in zip(weights[1], weights[k]):
                self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

    def test_accumulation_changes_without_a_retrace(self):
        model = model_and_optimizer()
        traces, step = [], model.train_step  # Keras runs train_step in Python when it traces
        object.__setattr__(model, "train_step", lambda data: traces.append(1) or step(data))
        x, y = np.ones((4, 6), np.float32), np.zeros(4, np.int64)
        model.train_on_batch(x, y)
        self.assertLen(traces, 1)
        model.accumulation.assign(2)
        for _ in range(4):
            model.train_on_batch(x, y)
        self.assertEqual(int(model.updates.numpy()), 3)  # 1 + 4 micro-batches / 2
        self.assertLen(traces, 1)


if __name__ == "__main__":
    tf.test.main()
