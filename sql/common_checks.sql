-- The checks most datasets want, one row per failing episode and check: episodes shorter than
-- $min_length steps, a return that is NaN or infinite, both end flags set at once, and a
-- `success` with no positive return (needs the meta field `success`; drop that branch without it).
-- No rows: every episode passes. The same predicates stored as `el.Check`s gate new episodes.
-- Run: episodelake sql PATH --file sql/common_checks.sql --param min_length=5
SELECT episode_id, 'too_short' AS failed_check FROM episodes WHERE length < $min_length
UNION ALL
SELECT episode_id, 'non_finite_return' FROM episodes WHERE NOT isfinite("return")
UNION ALL
SELECT episode_id, 'terminated_and_truncated' FROM episodes WHERE terminated AND truncated
UNION ALL
SELECT episode_id, 'success_without_return' FROM episodes WHERE success AND "return" <= 0
ORDER BY failed_check, episode_id
