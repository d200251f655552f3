"""The discrete-event simulator: the real scheduling policy and placement core on job traces.

`python -m apps.scheduling.sim --help`; no Django, no database. See engine.py for the event
loop and the preemption cost model, workload.py for traces and tenant assignment, report.py for
the outputs and how each figure is defined, validate.py for the segments.csv checks.
"""
