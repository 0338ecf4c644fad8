/**
 * hutch's error vocabulary on the client side. The server answers every
 * failure as `{code, message, request_id}`; a HutchError carries the same
 * code, so callers branch on `err.code === "not_found"` (or the helpers
 * below), never on message text.
 */

/** The wire codes the daemon uses (api/openapi.yaml, info.description). */
export type ErrorCode =
  | "invalid_argument"
  | "unauthenticated"
  | "permission_denied"
  | "not_found"
  | "already_exists"
  | "conflict"
  | "failed_precondition"
  | "payload_too_large"
  | "resource_exhausted"
  | "not_implemented"
  | "unavailable"
  | "deadline_exceeded"
  | "internal";

const statusCodes: Record<number, ErrorCode> = {
  400: "invalid_argument",
  401: "unauthenticated",
  403: "permission_denied",
  404: "not_found",
  409: "conflict",
  412: "failed_precondition",
  413: "payload_too_large",
  429: "resource_exhausted",
  501: "not_implemented",
  503: "unavailable",
  504: "deadline_exceeded",
};

export class HutchError extends Error {
  override readonly name = "HutchError";
  /** The wire code, e.g. "not_found". */
  readonly code: ErrorCode | string;
  /** The HTTP status, or 0 when the error never reached the daemon. */
  readonly status: number;
  readonly requestId: string | undefined;
  /** A refused state change: the state the sandbox is in. */
  readonly from: string | undefined;
  /** A refused state change: the state it was asked to go to. */
  readonly to: string | undefined;

  constructor(
    code: ErrorCode | string,
    message: string,
    extra: { status?: number; requestId?: string; from?: string; to?: string; cause?: unknown } = {},
  ) {
    super(message, extra.cause === undefined ? undefined : { cause: extra.cause });
    this.code = code;
    this.status = extra.status ?? 0;
    this.requestId = extra.requestId;
    this.from = extra.from;
    this.to = extra.to;
  }
}

/**
 * Builds the error for a failed response from its status and body. A body
 * that is not hutch's error JSON (a proxy's page, a truncated reply) still
 * yields a coded error, from the status.
 */
export function errorFromResponse(status: number, body: string): HutchError {
  try {
    const e = JSON.parse(body) as { code?: unknown; message?: unknown; request_id?: unknown; from?: unknown; to?: unknown };
    if (typeof e.code === "string" && typeof e.message === "string") {
      return new HutchError(e.code, e.message, {
        status,
        requestId: typeof e.request_id === "string" ? e.request_id : undefined,
        from: typeof e.from === "string" ? e.from : undefined,
        to: typeof e.to === "string" ? e.to : undefined,
      });
    }
  } catch {
    // not JSON: fall through to the status
  }
  const code = statusCodes[status] ?? "internal";
  const text = body.trim().slice(0, 200);
  return new HutchError(code, `HTTP ${status}${text ? `: ${text}` : ""}`, { status });
}

export function isNotFound(err: unknown): boolean {
  return err instanceof HutchError && err.code === "not_found";
}

export function isConflict(err: unknown): boolean {
  return err instanceof HutchError && (err.code === "conflict" || err.code === "already_exists");
}
