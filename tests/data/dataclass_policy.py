from dataclasses import dataclass


@dataclass
class Weights:
    service: float = 1000.0


class DataclassScheduling(SchedulingPolicy):
    def __init__(self):
        self.w = Weights()

    def priority(self, pcb, now):
        return int(round(pcb.attained_service_s * self.w.service))
