-- Episodes whose timestamps stall or go back: the transitions where the next observation's
-- timestamp is not after this one's, per episode the first such step and how many there are.
-- Replace "observation/t" and "next_observation/t" with your timestamp field.
-- Run: episodelake sql PATH --file sql/stalled_timestamps.sql
SELECT
    episode_id,
    min(t) AS first_step,
    count(*) AS stalled_steps
FROM steps
WHERE "next_observation/t" <= "observation/t"
GROUP BY episode_id
ORDER BY episode_id
