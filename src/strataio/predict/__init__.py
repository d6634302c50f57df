"""I/O-time prediction (the multi-storage paper's §4): calibration into the catalog's performance
table, equations (1) and (2) over strataio's I/O methods, workloads as TOML files, and measured
runs to compare with."""

from strataio.predict.model import Prediction, equation1, equation2, predict
from strataio.predict.perfdb import PerfTable, UncalibratedError
from strataio.predict.workload import Workload, WorkloadError, load_workload, parse_workload

__all__ = [
    "PerfTable",
    "Prediction",
    "UncalibratedError",
    "Workload",
    "WorkloadError",
    "equation1",
    "equation2",
    "load_workload",
    "parse_workload",
    "predict",
]
