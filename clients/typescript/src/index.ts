/**
 * The hutch TypeScript client: HutchClient over hutch's HTTP API (unix
 * socket or TCP with an API key), its errors, and the generated API types.
 * The framework adapters live under ./eve, ./rivet and ./zidane.
 */
export * from "./client.js";
export * from "./errors.js";
export { parseHost, type Endpoint } from "./transport.js";
export { AsyncQueue } from "./queue.js";
export { ProcessSession } from "./process.js";
export { runCommand, numericExitCode, type RunRequest, type RunResult, type RunOptions } from "./run.js";
export type { components, operations, paths } from "./generated/api.js";
