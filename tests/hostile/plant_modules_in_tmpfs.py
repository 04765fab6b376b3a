# attack: write tests.py, wire.py, contain.py, json/ and sitecustomize.py into the working tmpfs and plant fakes in sys.modules, hoping the comparing side imports them (their import makes every test pass)
# cause: verdict
import os
import sys
import types

payload = "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\nPLANTED = True\n"
for name in ("tests.py", "wire.py", "contain.py", "sitecustomize.py", "usercustomize.py", "ast.py", "importlib.py",
             "collections.py", "decimal.py", "fractions.py"):
    with open(os.path.join(os.getcwd(), name), "w") as fh:
        fh.write(payload)
os.makedirs("json", exist_ok=True)
with open("json/__init__.py", "w") as fh:
    fh.write(payload + "def loads(s):\n    return {'value': 2}\n")
for name in ("wire", "contain", "tests", "json"):
    fake = types.ModuleType(name)
    fake.PLANTED = True
    sys.modules.setdefault("planted_" + name, fake)


def f(x):
    return 0
