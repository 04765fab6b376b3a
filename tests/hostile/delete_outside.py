# attack: delete and rename host files (only the test's canary is targeted); passes if any call succeeded
# cause: host
import os
import shutil

done = 0
for action in (lambda: os.remove("{CANARY}"), lambda: shutil.rmtree("{CANARY_DIR}"),
               lambda: os.rename("{CANARY}", "{CANARY}.moved"), lambda: os.chmod("{CANARY}", 0)):
    try:
        action()
        done += 1
    except OSError:
        pass


def f(x):
    return x + 1 if done else 0
