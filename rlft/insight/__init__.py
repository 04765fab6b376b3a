"""What a run shows a person: held-out evaluation (eval.py), health warnings (health.py), plots (plot.py) and the HTML report (report.py)."""
