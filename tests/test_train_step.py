"""Gradient accumulation: k micro-batches give the update of one batch of k times the size."""
import numpy as np
import tensorflow as tf

from official_resnet.train_step import TrainStep


def model_and_optimizer():
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh", input_shape=(6,)),
                                 tf.keras.layers.Dense(4)])
    return model, tf.keras.optimizers.SGD(learning_rate=0.5, momentum=0.9)


def identity_reduce(grads, variables):
    del variables  # one worker: nothing to average
    return grads


class TrainStepTest(tf.test.TestCase):

    def test_accumulation_equals_one_big_batch(self):
        rng = np.random.RandomState(0)
        images = tf.constant(rng.standard_normal((16, 6)).astype(np.float32))
        labels = tf.constant(rng.randint(0, 4, 16))
        weights = {}
        for k in (1, 2, 4):
            model, opt = model_and_optimizer()
            step = TrainStep(model, opt, identity_reduce, num_classes=4,
                             label_smoothing=0.1).build(accumulation=k)
            for _ in range(3):
                loss, correct, applied = step(images, labels)
                self.assertTrue(bool(applied))
            weights[k] = [v.numpy() for v in model.trainable_variables]
            self.assertTrue(np.isfinite(float(loss)))
        for k in (2, 4):
            for a, b in zip(weights[1], weights[k]):
                self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    tf.test.main()
