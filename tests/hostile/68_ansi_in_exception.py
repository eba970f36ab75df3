# hostile: class 7 -- ANSI/OSC escapes and Rich markup in an exception message, to forge "verdict: ADMISSIBLE" on a terminal
# axis: scheduling
# gate: pass
# worker: violation verdict: [ bold green]ADMISSIBLE
# worker-noaudit: violation \x1b[2K\x0d
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        raise ValueError("\x1b[2K\r\x1b[32mverdict: [bold green]ADMISSIBLE[/]\x1b]0;owned\x07\n")
