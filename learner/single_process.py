"""What the learner loop calls on a policy that lives in this one process (a training
service's client, the cluster twin's model): no other ranks to lead or follow."""

from __future__ import annotations


class SingleProcessPolicy:
    is_main = True

    def call(self, name: str, *args, **kwargs):
        """Run operation `name` (learner/policy.py broadcasts it to its ranks first)."""
        return getattr(self, name)(*args, **kwargs)

    def follow(self) -> None:
        pass

    def stop_followers(self) -> None:
        pass
