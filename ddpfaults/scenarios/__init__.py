"""Built-in scenarios: one ``scenario_*.py`` module per field report (see ../shared/field-reports.md)."""
