"""The feasibility guard and guard-aware candidate construction (DESIGN.md §3.3 and §3.4), on counts only.

For the source-quota group, a candidate of size m passes when Σ max(0, τ_i − b_i') ≤ τ₀ − b₀', the counts
b' taken as if it were admitted. With D the deficit and R the remaining capacity before the candidate, any
candidate that passes contains at least x_min = max(0, D − (R − m)) units that each reduce a deficit, and
any candidate with that many passes. So the candidate takes x_min deficit-reducing units first, one at a
time from the source with the largest remaining deficit, and the guard can pass iff the pool supplies them.
"""

from __future__ import annotations


def deficits(quotas: tuple[int, ...], admitted: list[int]) -> list[int]:
    return [q - b if q > b else 0 for q, b in zip(quotas, admitted, strict=True)]


def guard_passes(quotas: tuple[int, ...], admitted_after: list[int], train_batch_size: int) -> bool:
    """The guard for one competing group, with the counts after the candidate."""
    return sum(deficits(quotas, admitted_after)) <= train_batch_size - sum(admitted_after)


def pick_by_priority(count: int, caps: list[int], priority: list[int], picks: list[int]) -> int:
    """Pick up to ``count`` units one at a time from the source with the largest remaining priority.

    Each pick lowers that source's priority and cap by one; ties go to the earlier source; sources with
    no cap or no priority left are skipped. Adds the picks to ``picks`` (and updates ``caps`` and
    ``priority``) and returns how many were made.

    Computed as water-filling rather than pick by pick: lowering every priority to a level L takes
    Σ min(cap_i, max(0, p_i − L)) picks; the lowest level whose cost fits is found by bisection, and the
    picks left over go one each to the sources standing exactly at that level, in source order.
    """

    def cost(level: int) -> int:
        return sum(min(c, p - level) for c, p in zip(caps, priority, strict=True) if p > level and c > 0)

    if count <= 0:
        return 0
    low, high = 0, max(priority, default=0)  # cost(high) == 0 <= count
    if cost(0) > count:
        while high - low > 1:  # invariant: cost(low) > count >= cost(high)
            middle = (low + high) // 2
            if cost(middle) > count:
                low = middle
            else:
                high = middle
        level = high
    else:
        level = 0
    made = 0
    for index, (cap, current) in enumerate(zip(caps, priority, strict=True)):
        take = min(cap, current - level) if current > level and cap > 0 else 0
        if take:
            picks[index] += take
            caps[index] -= take
            priority[index] -= take
            made += take
    if level > 0:
        for index in range(len(caps)):
            if made == count:
                break
            if priority[index] == level and caps[index] > 0:
                picks[index] += 1
                caps[index] -= 1
                priority[index] -= 1
                made += 1
    return made


def plan_forced_picks(
    *,
    available: list[int],
    deficit: list[int],
    remaining_capacity: int,
    size: int,
    minimums: list[int] | None,
    guard: bool,
) -> tuple[list[int], int]:
    """How many units to take from the head of each source before the policy-order fill.

    ``minimums`` are per-source counts the policy wants first (``linear`` mirrors the final composition);
    when they do not fit in ``size`` they are trimmed, largest deficit first. With ``guard``, x_min
    deficit-reducing units follow, as many as the candidate has room for. Returns the per-source counts (never
    more than ``size`` in all) and the shortfall: how many more deficit-reducing units the guard would need than
    the pool holds or the candidate has room for (0 when it can pass). Room runs short only when the deficit
    already exceeds the remaining capacity, as after a mini-batch admitted with the quotas waived.
    """
    picks = [0] * len(available)
    caps = list(available)
    remaining = list(deficit)
    if minimums is not None:
        wanted = [min(m, c) for m, c in zip(minimums, caps, strict=True)]
        if sum(wanted) <= size:
            for index, count in enumerate(wanted):
                picks[index] = count
                caps[index] -= count
                remaining[index] -= min(count, remaining[index])
        else:
            caps_for_minimums = wanted
            pick_by_priority(size, caps_for_minimums, remaining, picks)
            caps = [c - p for c, p in zip(caps, picks, strict=True)]
    if not guard:
        return picks, 0
    # x_min after the minimums: the remaining deficit minus the room the rest of the train batch leaves.
    needed = sum(remaining) - (remaining_capacity - size)
    if needed <= 0:
        return picks, 0
    supply_caps = [min(c, d) for c, d in zip(caps, remaining, strict=True)]
    made = pick_by_priority(min(needed, size - sum(picks)), supply_caps, remaining, picks)
    return picks, needed - made
