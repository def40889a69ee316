package redisdlq

// TrimWithLimit is Writer.Trim with the node-pass limit of a test.
var TrimWithLimit = (*Writer).trim
