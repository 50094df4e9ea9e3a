"""Stage 6, report: the console while a run works, report.md/html with plots, and advice."""
