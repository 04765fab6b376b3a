# attack: a SIGALRM handler fired by signal.setitimer walks f_back from whatever frame is running, looking for the verdict writer (a "report" function or "fd_report" local) to call with forged lines
# cause: verdict
import signal

found = []


def handler(signum, frame):
    while frame is not None:
        names = dict(frame.f_globals)
        names.update(frame.f_locals)
        if "fd_report" in names or "Unportable" in names:  # the tests' process's verdict writer
            found.append(frame)
            report = names.get("report")
            if callable(report):
                report("pass 0\npass 1\ndone")
        frame = frame.f_back


signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)


def f(x):
    for _ in range(20000):
        pass
    return x + 1 if found else 0
