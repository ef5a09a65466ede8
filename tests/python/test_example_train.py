"""python/examples/train_llama.py on several ranks (under mpiexec) equals one process: every
step's loss and the final parameters in float64."""
import os
import sys
import unittest

import torch
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "examples"))
sys.path.insert(0, HERE)
import reference  # noqa: E402
import train_llama  # noqa: E402

COMM = MPI.COMM_WORLD


class ExampleTest(unittest.TestCase):
    def test_parallel_training_equals_one_process(self):
        for layout in ("zigzag", "contiguous"):
            with self.subTest(layout=layout):
                loss1, params1 = train_llama.train(comm=None)
                lossR, paramsR = train_llama.train(comm=COMM, layout=layout)
                self.assertGreater(loss1[0] - loss1[-1], 0.0, f"training did not lower the loss: {loss1}")
                bad = []
                for a, b in zip(lossR, loss1):
                    if abs(a - b) > 1e-12 * abs(b):
                        bad.append(f"loss {a!r} vs {b!r}")
                for n in params1:
                    ok, err, scale = reference.close(paramsR[n], params1[n], 1e-12)
                    if not ok:
                        bad.append(f"{n}: max|a-b| = {err:.3e}, max|b| = {scale:.3e}")
                verdicts = COMM.allgather(bad)
                self.assertFalse(any(verdicts), f"per rank: {verdicts}")


if __name__ == "__main__":
    if COMM.Get_size() < 2:
        sys.exit("test_example_train.py needs mpiexec -n 2 or more")
    unittest.main()
