"""After a sweep measured: its report and its regression gate, shared by the sweep's end and the
``pipeline.report`` and ``pipeline.gate`` commands; may import record, analysis and below, never run
or a command."""
