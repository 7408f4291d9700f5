"""Result records, comparison tables and reports."""
