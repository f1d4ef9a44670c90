-- Success rate and return by task: per task, the number of episodes, the share that succeeded
-- (an unset `success` counts as not succeeded) and the mean, min and max return.
-- Needs the meta fields `task` (str) and `success` (bool).
-- Run: episodelake sql PATH --file sql/success_by_task.sql
SELECT
    task,
    count(*) AS episodes,
    avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
    avg("return") AS mean_return,
    min("return") AS min_return,
    max("return") AS max_return
FROM episodes
GROUP BY task
ORDER BY task
