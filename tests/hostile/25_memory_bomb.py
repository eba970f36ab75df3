# hostile: allocate 16 GiB
# axis: retention
# gate: pass
# worker: violation MemoryError
# worker-noaudit: contained
class P(RetentionPolicy):
    def on_turn_complete(self, pcb, request_id, now):
        self.hog = [0] * (1 << 32)
        return "release"
