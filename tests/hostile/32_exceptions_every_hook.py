# hostile: raise in every retention hook
# axis: retention
# gate: pass
# worker: violation raised
# worker-noaudit: contained
class P(RetentionPolicy):
    def on_turn_complete(self, pcb, request_id, now):
        raise ValueError("boom")

    def on_turn_arrival(self, pcb, now):
        raise KeyError("boom")
