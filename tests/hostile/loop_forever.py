# attack: a busy loop that never ends (wall clock and RLIMIT_CPU)
while True:
    pass
