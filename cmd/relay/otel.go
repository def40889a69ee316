package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// defaultServiceName is the service.name of Relay's spans unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names another.
const defaultServiceName = "relay"

// tracingFlushTimeout bounds the export of the spans still buffered when
// the process stops.
const tracingFlushTimeout = 5 * time.Second

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	protoGRPC = "grpc"
	protoHTTP = "http/protobuf"
)

// tracingSetup is what the standard OpenTelemetry variables ask for
// (docs/observability.md#turning-it-on).
type tracingSetup struct {
	// protocol is protoGRPC or protoHTTP; "" means tracing is off.
	protocol string
	// endpoint is the OTLP endpoint variable that turned tracing on.
	endpoint string
}

// tracingFromEnv reads the variables that decide whether and how spans are
// exported: tracing is on when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT is set, unless OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none. The protocol is
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL,
// http/protobuf by default as the OTLP exporter specification says. The
// exporters read the rest themselves (headers, timeout, TLS, compression,
// insecure), the SDK the sampler (OTEL_TRACES_SAMPLER, _ARG) and the batch
// processor (OTEL_BSP_*).
func tracingFromEnv(getenv func(string) string) (tracingSetup, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return tracingSetup{}, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return tracingSetup{}, nil
	default:
		return tracingSetup{}, usagef("OTEL_TRACES_EXPORTER=%s is not supported: use otlp (the default) or none", exp)
	}
	var s tracingSetup
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if getenv(name) != "" {
			s.endpoint = name
			break
		}
	}
	if s.endpoint == "" {
		return tracingSetup{}, nil
	}
	s.protocol = protoHTTP
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			switch v {
			case protoGRPC, protoHTTP:
				s.protocol = v
			default:
				return tracingSetup{}, usagef("%s=%s is not supported: use grpc or http/protobuf", name, v)
			}
			break
		}
	}
	return s, nil
}

// startTracing turns tracing on as the OTEL_* variables say
// (tracingFromEnv): it builds a TracerProvider exporting over OTLP and
// installs it as the global provider, which the library's Engine, Invoke
// and Replay default to. It returns the provider and the function that
// flushes and stops it, to run before exit. With tracing off (no OTLP
// endpoint) nothing is started or installed, and the provider returned is
// a noop one, whose spans cost next to nothing and still carry a
// producer's trace context on to the handlers. Export failures are logged at warn level, never fatal: a
// collector outage must not stop the worker.
func startTracing(ctx context.Context, log *slog.Logger) (trace.TracerProvider, func(), error) {
	s, err := tracingFromEnv(os.Getenv)
	if err != nil {
		return nil, nil, err
	}
	if s.protocol == "" {
		return noop.NewTracerProvider(), func() {}, nil
	}
	// The SDK and the exporters report through the global handler, by
	// default the standard logger; route it to ours.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.LogAttrs(context.Background(), slog.LevelWarn, "tracing: export or configuration problem", slog.Any("error", err))
	}))
	var exp sdktrace.SpanExporter
	switch s.protocol {
	case protoGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP %s exporter for %s: %w", s.protocol, s.endpoint, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", defaultServiceName)),
		// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME override the
		// default name.
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, nil, fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	log.LogAttrs(ctx, slog.LevelInfo, "tracing on", slog.String("protocol", s.protocol), slog.String("endpoint_from", s.endpoint))
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.LogAttrs(sctx, slog.LevelWarn, "tracing: flushing spans at exit failed; the last spans are lost", slog.Any("error", err))
		}
	}
	return tp, stop, nil
}
