package runtime

import (
	"slices"
	"strconv"
)

// Names of the variables every runner sets (docs/apps.md "The handler contract").
const (
	EnvHandler   = "RELAY_HANDLER"
	EnvApp       = "RELAY_APP"
	EnvMessageID = "RELAY_MESSAGE_ID"
	EnvAttempt   = "RELAY_ATTEMPT"
)

// Environ returns the handler's environment as sorted "NAME=value" entries:
// req.Spec.Env, then req.Env (TRACEPARENT and the like) overriding it, then
// the RELAY_* contract variables overriding both. Each name appears once.
func Environ(req Request) []string {
	vars := make(map[string]string, len(req.Spec.Env)+len(req.Env)+4)
	for k, v := range req.Spec.Env {
		vars[k] = v
	}
	for k, v := range req.Env {
		vars[k] = v
	}
	vars[EnvHandler] = req.Handler
	vars[EnvApp] = req.App
	vars[EnvMessageID] = req.MessageID
	vars[EnvAttempt] = strconv.Itoa(req.Attempt)
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return env
}
