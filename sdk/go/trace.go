package jobfence

import (
	"context"
	"regexp"

	"google.golang.org/grpc/metadata"
)

// traceKey is the context key of the caller's W3C trace context.
type traceKey struct{}

type traceContext struct{ parent, state string }

// traceparentFormat is a W3C traceparent of version 00: a trace id of 32
// lowercase hex digits and a span id of 16, neither all zeros, and the
// flags.
var traceparentFormat = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// WithTraceparent returns a context whose jobfence calls carry the W3C
// trace context traceparent ("00-<trace id>-<span id>-<flags>") and,
// when not empty, tracestate: a coordinator that exports its spans
// (`jobfence serve --otlp-endpoint`) makes its span of each such call a
// child of that span. With OpenTelemetry Go, pass the current span's:
//
//	sc := trace.SpanContextFromContext(ctx)
//	ctx = jobfence.WithTraceparent(ctx,
//		fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags()),
//		sc.TraceState().String())
//
// A traceparent not of that form is not sent (the calls go as before).
func WithTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	if !validTraceparent(traceparent) {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, traceContext{parent: traceparent, state: tracestate})
}

func validTraceparent(v string) bool {
	const zeroTrace, zeroSpan = "00000000000000000000000000000000", "0000000000000000"
	return traceparentFormat.MatchString(v) && v[3:35] != zeroTrace && v[36:52] != zeroSpan
}

// withTraceMetadata adds the trace context of WithTraceparent, if any, to
// the call's outgoing metadata.
func withTraceMetadata(ctx context.Context) context.Context {
	tc, ok := ctx.Value(traceKey{}).(traceContext)
	if !ok {
		return ctx
	}
	if tc.state != "" {
		return metadata.AppendToOutgoingContext(ctx, "traceparent", tc.parent, "tracestate", tc.state)
	}
	return metadata.AppendToOutgoingContext(ctx, "traceparent", tc.parent)
}
