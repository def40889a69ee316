// Tests that the example apps load and that their handlers behave as the
// README says, through the Process runner and, when a containerd is
// available (see internal/containerdtest), the containerd runner.
package apps_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

type demoCase struct {
	event        string
	app, handler string
	wantOut      string // substring of the forwarded output
	wantCode     int    // 0: success
	wantTimeout  bool
}

var demo = []demoCase{
	{
		event: `{"event_name":"INSERT","table_name":"users","new_image":{"id":7,"email":"ada@example.com"}}`,
		app:   "users", handler: "events.created",
		wantOut: "[users/events.created] welcome user ada@example.com (message 1-0, attempt 1)\n",
	},
	{
		event: `{"event_name":"DELETE","table_name":"users","old_image":{"id":7}}`,
		app:   "users", handler: "events.deleted",
		wantOut: "[users/events.deleted] goodbye user 7\n",
	},
	{
		event: `{"event_name":"INSERT","table_name":"invoices","new_image":{"id":"inv_1","amount":20}}`,
		app:   "billing", handler: "invoices.charge",
		wantOut: "[billing/invoices.charge] billing: payment provider unreachable", wantCode: 3,
	},
	{
		event: `{"event_name":"DELETE","table_name":"invoices","old_image":{"id":"inv_1"}}`,
		app:   "billing", handler: "invoices.refund",
		wantOut: "[billing/invoices.refund] billing: refund rejected on attempt 1", wantCode: 3,
	},
	{
		event: `{"event_name":"UPDATE","table_name":"invoices","new_image":{"id":"inv_2","amount":5000}}`,
		app:   "billing", handler: "invoices.reconcile",
		wantOut: "reconciling a large invoice", wantTimeout: true,
	},
}

func loadApps(t *testing.T) *relay.Apps {
	t.Helper()
	apps, err := relay.LoadApps(".")
	if err != nil {
		t.Fatal(err)
	}
	if errs := apps.Errors(); len(errs) > 0 {
		t.Fatalf("example templates are invalid:\n%v", errs)
	}
	for _, name := range []string{"users", "billing"} {
		if apps.Get(name) == nil {
			t.Fatalf("app %s not loaded", name)
		}
	}
	return apps
}

func TestTemplates(t *testing.T) {
	apps := loadApps(t)
	m := apps.Matcher()
	for _, c := range demo {
		targets, err := m.Match([]byte(c.event))
		if err != nil {
			t.Fatal(err)
		}
		if len(targets) != 1 || targets[0].App != c.app || targets[0].Handler != c.handler {
			t.Errorf("%s matched %+v, want only %s/%s", c.event, targets, c.app, c.handler)
		}
	}
	for _, r := range apps.Get("billing").Rules {
		if r.Handler == "invoices.charge" && r.Retries != 0 {
			t.Errorf("invoices.charge retries = %d, want 0 (straight to the DLQ)", r.Retries)
		}
	}
}

func TestHandlersProcess(t *testing.T) {
	var out bytes.Buffer
	p, err := runtime.NewProcess(runtime.WithOutput(&out, &out))
	if err != nil {
		t.Fatal(err)
	}
	runDemo(t, loadApps(t), p, &out)
}

func TestHandlersContainerd(t *testing.T) {
	c := containerdtest.Client(t)
	var out bytes.Buffer
	r, err := containerd.New(c, containerd.WithNamespace(c.DefaultNamespace()), containerd.WithOutput(&out, &out))
	if err != nil {
		t.Fatal(err)
	}
	runDemo(t, loadApps(t), r, &out)
	containerdtest.AssertClean(t, c)
}

func runDemo(t *testing.T, apps *relay.Apps, runner relay.Runner, out *bytes.Buffer) {
	for _, c := range demo {
		t.Run(c.app+"/"+c.handler, func(t *testing.T) {
			out.Reset()
			app := apps.Get(c.app)
			var rule relay.Rule
			for _, r := range app.Rules {
				if r.Handler == c.handler {
					rule = r
				}
			}
			req := runtime.Request{
				App: c.app, Handler: c.handler, MessageID: "1-0", Attempt: 1,
				Event: []byte(c.event), Timeout: rule.Timeout, Spec: app.Spec,
			}
			_, err := runner.Run(t.Context(), req)
			ee, isExit := errors.AsType[*runtime.ExitError](err)
			switch {
			case c.wantTimeout:
				if !isExit || !ee.TimedOut {
					t.Errorf("got %v, want a timeout", err)
				}
			case c.wantCode != 0:
				if !isExit || ee.Code != c.wantCode {
					t.Errorf("got %v, want exit code %d", err, c.wantCode)
				}
			case err != nil:
				t.Errorf("got %v, want success", err)
			}
			if !strings.Contains(out.String(), c.wantOut) {
				t.Errorf("output lacks %q:\n%s", c.wantOut, out)
			}
		})
	}
}
