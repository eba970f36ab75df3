"""Policy interfaces and shipped policies (paper Appendix E)."""
from .base import PolicyError, RetentionPolicy, RoutingPolicy, SchedulingPolicy
from .registry import AXES, load_policy, policy_names

__all__ = ["RetentionPolicy", "SchedulingPolicy", "RoutingPolicy", "PolicyError", "AXES",
           "load_policy", "policy_names"]
