# hostile: open() the workload trace to read future calls
# axis: scheduling
# gate: reject 'open'
# worker: violation NameError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        with_data = open("/work/shared/reference/traces/README.md").read()
        return len(with_data)
