"""After a sweep measured: its report and its regression gate, as library functions that the
sweep's end and the ``pipeline.report`` and ``pipeline.gate`` commands share. May import
record, analysis and below; never run or an entry point."""
