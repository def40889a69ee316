package main

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

func TestTracingFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    tracingSetup
		wantErr string
	}{
		{name: "nothing set: off"},
		{
			name: "endpoint: on, http/protobuf by default",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			want: tracingSetup{protocol: protoHTTP, endpoint: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		},
		{
			name: "traces endpoint and grpc",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			want: tracingSetup{protocol: protoGRPC, endpoint: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		},
		{
			name: "the traces protocol wins",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
				"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
			want: tracingSetup{protocol: protoGRPC, endpoint: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		},
		{
			name: "protocol without endpoint: off",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		},
		{
			name: "exporter none: off",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"},
		},
		{
			name: "sdk disabled: off",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"},
		},
		{
			name:    "http/json is refused",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL=http/json is not supported",
		},
		{
			name:    "another exporter is refused",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "zipkin"},
			wantErr: "OTEL_TRACES_EXPORTER=zipkin is not supported",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tracingFromEnv(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				var ue usageError
				if !errors.As(err, &ue) {
					t.Errorf("error %v is not a usage error (exit 2)", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("setup = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// otlpReceiver collects what OTLP exporters send it: the span names per
// service.name.
type otlpReceiver struct {
	mu       sync.Mutex
	requests int
	spans    []*tracepb.Span
	services []string
}

func (r *otlpReceiver) add(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				r.services = append(r.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
}

func (r *otlpReceiver) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.spans {
		out = append(out, s.GetName())
	}
	slices.Sort(out)
	return out
}

func (r *otlpReceiver) snapshot() (requests int, spans []*tracepb.Span, services []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, slices.Clone(r.spans), slices.Clone(r.services)
}

// serveOTLPHTTP starts an OTLP/HTTP receiver accepting POST /v1/traces.
func serveOTLPHTTP(t *testing.T) (*otlpReceiver, string) {
	r := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST /v1/traces with application/x-protobuf", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &msg)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&msg)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

type grpcTraceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *otlpReceiver
}

func (s grpcTraceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serveOTLPGRPC starts an OTLP/gRPC receiver on a loopback port.
func serveOTLPGRPC(t *testing.T) (*otlpReceiver, string) {
	r := &otlpReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, grpcTraceService{r: r})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return r, "http://" + ln.Addr().String()
}

// keepGlobalProvider restores the global tracer provider startTracing
// replaces.
func keepGlobalProvider(t *testing.T) {
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
}

// TestStartTracingExports turns tracing on with each OTLP protocol against
// a receiver of the test's own and checks that spans arrive, with the
// service name from OTEL_SERVICE_NAME or the default, by the time the stop
// function returns.
func TestStartTracingExports(t *testing.T) {
	for _, tc := range []struct {
		protocol string
		serve    func(t *testing.T) (*otlpReceiver, string)
		service  string
	}{
		{protocol: "http/protobuf", serve: serveOTLPHTTP, service: "relay"},
		{protocol: "grpc", serve: serveOTLPGRPC, service: "relay-eu"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			keepGlobalProvider(t)
			r, endpoint := tc.serve(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			if tc.service != "relay" {
				t.Setenv("OTEL_SERVICE_NAME", tc.service)
			}
			tp, stop, err := startTracing(t.Context(), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := tp.(*sdktrace.TracerProvider); !ok {
				t.Fatalf("provider %T, want the SDK's", tp)
			}
			if otel.GetTracerProvider() != tp {
				t.Error("the provider is not installed as the global one")
			}
			ctx, parent := otel.Tracer("test").Start(context.Background(), "stream.message")
			_, child := otel.Tracer("test").Start(ctx, "function.invoke")
			child.End()
			parent.End()
			stop()
			requests, spans, services := r.snapshot()
			if requests == 0 {
				t.Fatal("no export request arrived")
			}
			if diff := cmp.Diff([]string{"function.invoke", "stream.message"}, r.names()); diff != "" {
				t.Errorf("spans (-want +got):\n%s", diff)
			}
			if len(spans) == 2 && string(spans[0].GetTraceId()) != string(spans[1].GetTraceId()) {
				t.Error("parent and child were exported in different traces")
			}
			if len(services) == 0 || services[0] != tc.service {
				t.Errorf("service.name %q, want %q", services, tc.service)
			}
		})
	}
}

// TestStartTracingOff: without an OTLP endpoint nothing is built or
// installed.
func TestStartTracingOff(t *testing.T) {
	keepGlobalProvider(t)
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "")
	}
	before := otel.GetTracerProvider()
	tp, stop, err := startTracing(t.Context(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, ok := tp.(*sdktrace.TracerProvider); ok {
		t.Error("an SDK provider was built with no endpoint set")
	}
	if otel.GetTracerProvider() != before {
		t.Error("the global provider was replaced with no endpoint set")
	}
	if _, ok := tp.(noop.TracerProvider); !ok {
		t.Errorf("provider with tracing off = %T, want a noop one", tp)
	}
}

// TestStartTracesEndToEnd runs relay start (process runner) with an OTLP
// endpoint and publishes an event carrying a producer's traceparent: the
// worker exports stream.message and function.invoke in the producer's
// trace, and the handler sees its function.invoke span as TRACEPARENT.
func TestStartTracesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildRelay(t)
	apps := t.TempDir()
	if err := os.MkdirAll(filepath.Join(apps, "orders"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"template.yaml": "image: relay.local/busybox:latest\ncommand: [\"/bin/sh\", \"/app/handler.sh\"]\n" +
			"events:\n  - handler: orders.created\n    pattern: {kind: [order]}\n    timeout: 10s\n",
		"handler.sh": "echo \"traceparent=$TRACEPARENT\"\n",
	} {
		if err := os.WriteFile(filepath.Join(apps, "orders", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, endpoint := serveOTLPHTTP(t)
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	cmd := exec.Command(bin, "start", "--runner", "process")
	cmd.Env = append(os.Environ(), "REDIS_URI="+srv.Addr, "REDIS_STREAM=events", "REDIS_GROUP=relay",
		"RELAY_APPS="+apps, "RELAY_CONSUMER=traced", "RELAY_STATE_DIR="+t.TempDir(), "LOG_LEVEL=info",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=100")
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("output:\n%s", out)
		}
	})

	const producerTrace = "0af7651916cd43dd8448eb211c80319c"
	src := redisstream.New(rc, "events", "relay", "publisher")
	id, err := src.Publish(t.Context(), map[string]string{
		"event": `{"kind":"order"}`, "traceparent": "00-" + producerTrace + "-b7ad6b7169203331-01",
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the handler's run and the ack", func() bool {
		n, _, err := src.Pending(t.Context())
		return err == nil && n == 0 && strings.Contains(out.String(), "traceparent=00-")
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("relay start exited with %v", err)
	}
	stopped = true

	// Every span is flushed by the time the process exits.
	_, spans, services := r.snapshot()
	var invoke *tracepb.Span
	names := map[string]int{}
	for _, s := range spans {
		names[s.GetName()]++
		if got := hexID(s.GetTraceId()); got != producerTrace {
			t.Errorf("span %s in trace %s, want the producer's %s", s.GetName(), got, producerTrace)
		}
		if s.GetName() == "function.invoke" {
			invoke = s
		}
	}
	if names["stream.message"] != 1 || names["function.invoke"] != 1 {
		t.Fatalf("exported spans %v, want one stream.message and one function.invoke", names)
	}
	if want := "traceparent=00-" + producerTrace + "-" + hexID(invoke.GetSpanId()) + "-01"; !strings.Contains(out.String(), "[orders/orders.created] "+want) {
		t.Errorf("handler output lacks %q", want)
	}
	if !slices.Contains(services, "relay") {
		t.Errorf("service names %q, want relay", services)
	}
	if !strings.Contains(out.String(), "message_id="+id) || !strings.Contains(out.String(), "trace_id="+producerTrace) {
		t.Error("no log line names the message and its trace")
	}
}

func hexID(b []byte) string { return hex.EncodeToString(b) }
