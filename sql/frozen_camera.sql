-- Episodes whose camera froze: those with a run of at least $min_repeat consecutive transitions
-- that left the frame unchanged (observation == next_observation), with the first step of the
-- first such run and the longest run. Over `steps`, so for a camera stored in the table (a frame
-- of at most 1 KiB); replace "observation/camera" and "next_observation/camera" with your field.
-- Run: episodelake sql PATH --file sql/frozen_camera.sql --param min_repeat=3
WITH same AS (
    SELECT episode_id, t, t - row_number() OVER (PARTITION BY episode_id ORDER BY t) AS run
    FROM steps
    WHERE "observation/camera" = "next_observation/camera"
),
runs AS (
    SELECT episode_id, min(t) AS first_step, count(*) AS frozen_steps
    FROM same
    GROUP BY episode_id, run
)
SELECT episode_id, min(first_step) AS first_step, max(frozen_steps) AS longest_freeze
FROM runs
WHERE frozen_steps >= $min_repeat
GROUP BY episode_id
ORDER BY episode_id
