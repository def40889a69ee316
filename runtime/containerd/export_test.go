package containerd

// StopPresence stops r refreshing its presence label and leaves the label
// and every container in place, as a SIGKILL of its process would.
func StopPresence(r *Runner) { r.stopPresence() }

// WriterMayLive exposes writerMayLive.
var WriterMayLive = writerMayLive
