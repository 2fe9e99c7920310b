"""Grouping items under a padded token budget: training micro-batches and regenerate batches alike."""

from __future__ import annotations


def group_under_budget(sizes: list[int], token_budget: int) -> list[list[int]]:
    """Return the indices of consecutive items grouped while `len(group) x largest size <= token_budget`
    (padded rows: every row of a group is as long as its longest); an item over the budget is alone."""
    groups: list[list[int]] = []
    longest = 0
    for index, size in enumerate(sizes):
        if groups and (len(groups[-1]) + 1) * max(longest, size) <= token_budget:
            groups[-1].append(index)
            longest = max(longest, size)
        else:
            groups.append([index])
            longest = size
    return groups
