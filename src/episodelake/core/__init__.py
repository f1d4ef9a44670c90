"""Values and rules that touch no storage: the error hierarchy, progress bars, codecs, the schema and its
role table, episodes and their T+1 rule, statistics, segments, frame transforms, value checks.

May import: nothing of episodelake outside ``core``.
"""
