"""The result record's assembly from the ranks' summaries (the records
themselves: :mod:`securevfl.records`), comparison tables and reports."""
