"""`ghpsim report`: one self-contained HTML report (and a Markdown twin) of a scenario, a compare
or simulate result, a sweep or a validation table.

inputs.py (detect and load INPUT; input_checks.py checks the values it reads) -> build.py +
*_section(s).py (sections of tables and figures, plots.py draws) -> render.py (jinja2 templates,
atomic writes) ; document.py holds the report as data (Report, Section, Table, Figure) ;
command.py is the CLI verb.
"""
