# hostile: a protect decision with a non-numeric deadline
# axis: retention
# gate: pass
# worker: violation must be a number
# worker-noaudit: contained
class P(RetentionPolicy):
    def on_turn_complete(self, pcb, request_id, now):
        return ("protect", "tomorrow")
