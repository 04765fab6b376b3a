"""Scripts that run inside the code sandbox's jail, standard library only (``rlft.rewards.jail`` starts them).

``program.py`` runs the untrusted program and answers calls; ``tests.py`` runs
the task's tests and writes the verdict; ``wire.py`` is the plain-data channel
between them; ``contain.py`` is what each script does before anything else runs;
``main.py`` runs a plain program with its output on two pipes (``sandbox.run_program``).
"""
