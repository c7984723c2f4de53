// Package agent runs one episode: it builds the messages, asks a Policy for
// the next assistant turn, runs the tool calls it makes in the episode's
// sandbox, and records every step in a trajectory, until the episode ends
// (finish, max turns, context budget, deadline, policy or sandbox failure).
//
// Policies live in sub-packages (agent/openai, agent/scripted); rewards in
// agent/reward; the trajectory types in agent/trajectory.
package agent
