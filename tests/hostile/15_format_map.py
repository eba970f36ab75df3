# hostile: format_map traversal
# axis: scheduling
# gate: reject attribute '.format_map'
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return len("{p.program_id}".format_map({"p": pcb}))
