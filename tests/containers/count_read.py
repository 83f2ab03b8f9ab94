"""Run inside the client container (``python -c "$(cat count_read.py)" N DELAY_MS JOB_NAME``): reads
``Dataset.range(N)``, each element ``DELAY_MS`` late on its worker, in ``distributed_epoch`` from the compose
cluster's dispatcher, and counts what arrives.

Prints ``progress K`` every 100 elements (the test breaks the cluster at a count), then one line
``RESULT {json}``: elements received, distinct values, duplicates, missing. Its functions are defined here, in
``__main__``, so the workers get them by value: nothing of the test is installed in the image.
"""

import collections
import json
import sys
import time

from dataservice import Dataset, distribute

N, DELAY_S = int(sys.argv[1]), float(sys.argv[2]) / 1000
JOB_NAME = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None


def slow(x):
    time.sleep(DELAY_S)
    return x


dataset = Dataset.range(N).map(slow).apply(
    distribute("distributed_epoch", "grpc://dispatcher:5050", job_name=JOB_NAME, timeout_ms=120_000))
counts = collections.Counter()
received = 0
for value in dataset:
    counts[int(value)] += 1
    received += 1
    if received % 100 == 0:
        print(f"progress {received}", flush=True)
print("RESULT " + json.dumps({"elements": received, "distinct": len(counts),
                              "duplicates": sum(1 for c in counts.values() if c > 1),
                              "missing": sum(1 for v in range(N) if v not in counts)}), flush=True)
