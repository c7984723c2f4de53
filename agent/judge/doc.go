// Package judge asks generative reward models (judges: OpenAI-compatible
// chat endpoints distinct from the policy's) to score an episode on
// rubrics, and combines their answers into a reward.
//
// Each rubric names what of the episode its judges see (the final answer,
// the workspace's diff against the task's files, the transcript, selected
// tool outputs), each view bounded with its head and tail kept and the cut
// recorded. Every judge is asked every rubric (or the rubric's own list of
// judges) samples times; one request per (judge, rubric, sample). An
// answer is parsed robustly: a JSON object with the score and a reason,
// else text such as "Score: 7/10" or a scale label. Scores are normalised
// to 0..1 on the rubric's scale; a judge's samples are averaged; judges
// are combined per rubric (mean, median, min, trimmed mean); rubrics by
// their weights.
//
// A Pool holds what episodes share: a bound on requests in flight per
// endpoint, and a cache keyed by the judge, the sample index and the whole
// request (rubric and content), so a replay or a rescore of the same
// episode costs no request. A request that fails (an error, a 5xx or 429,
// a timeout, an answer without a score on the scale) is retried; one that
// still fails makes the judge reward unscored (trajectory.RewardJudgeError),
// never 0.
package judge
