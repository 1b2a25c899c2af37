"""Analysis of traces: pure functions over ``Trace`` that answer where a step's time went.

``analyze.analyze([(label, trace)], step_range, top)`` gives a ``result.Report`` (a summary per
trace and all together; ``analyze_file`` and ``combine`` are its map and its reduce);
``diff.diff_summaries(a, b)`` compares two summaries.  The result types and their JSON schema are
in ``result.py``.  Nothing here reads or writes files.
"""
