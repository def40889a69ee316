package matcher

// Node is one node of a pattern's syntax tree: the part of a YAML document
// that ParseTree reads, with the position of every node, independent of any
// YAML library. Package matcher/yamlpattern builds Nodes from YAML text or
// from a node of a YAML file. Keeping the YAML library out of this package
// keeps it out of every program that only matches events.
//
// A nil *Node is a missing value, such as the value of "status:" with
// nothing after it.
type Node struct {
	Kind NodeKind
	// Line and Col are the 1-based position where the node starts (see
	// yamlpattern.NodePos); 0 means unknown, and a problem with the node is
	// then reported at the position of the node that holds it.
	Line, Col int
	// Text is the node as written, without quotes and with escapes decoded:
	// a scalar's characters ("" for KindImplicitNull), a tag's name
	// ("!!str"), and for other nodes the indicator that starts them ("&" of
	// an anchor, "*" of an alias, "|" or ">" of a block scalar, "{" or "["
	// of a flow collection, "?" of a complex key). Messages quote it.
	Text string
	// Value is the string a KindString or KindBlock node holds, and the
	// name of a KindAlias.
	Value string
	// Style says how a KindString was written.
	Style Style
	// Bool is the value of a KindBool node.
	Bool bool
	// Number is the value of a KindInt or KindFloat node as the YAML reader
	// decoded it, in decimal ("31" for 0x1f), for a suggestion in the error
	// that rejects it; "" when unknown.
	Number string
	// Entries are the key/value pairs of a KindMapping, in source order.
	Entries []Entry
	// Elems are the elements of a KindSequence; an element may be nil.
	Elems []*Node
	// Inner is the node a KindTag or KindAnchor applies to; nil when there
	// is none.
	Inner *Node
}

// Entry is one key/value pair of a KindMapping. Key or Value is nil when
// missing. Line and Col are where the entry starts: its key, or the ":"
// when the key has no position; 0 means unknown.
type Entry struct {
	Key, Value *Node
	Line, Col  int
}

// NodeKind is the kind of a Node.
type NodeKind uint8

// The kinds of Node. Scalars are typed as YAML 1.2 reads them unquoted: 35
// is a KindInt, "35" a KindString.
const (
	KindUnknown      NodeKind = iota // anything else; always an error
	KindMapping                      // {a: 1} or a block mapping
	KindSequence                     // [a, b] or a block sequence
	KindString                       // a plain or quoted string scalar
	KindBlock                        // a literal (|) or folded (>) block scalar
	KindInt                          // an integer scalar, in any base
	KindFloat                        // a float scalar
	KindBool                         // true or false
	KindNull                         // null or ~
	KindImplicitNull                 // an empty scalar, read as null
	KindInf                          // .inf, -.inf
	KindNaN                          // .nan
	KindTag                          // a tag (!!str, !!map, ...) on Inner
	KindAnchor                       // an anchor (&name) on Inner
	KindAlias                        // an alias (*name)
	KindMergeKey                     // the merge key <<
	KindComplexKey                   // a complex key (? key)
)

// String names the kind as error messages do ("mapping", "alias").
func (k NodeKind) String() string {
	switch k {
	case KindMapping:
		return "mapping"
	case KindSequence:
		return "sequence"
	case KindString:
		return "string"
	case KindBlock:
		return "literal"
	case KindInt:
		return "integer"
	case KindFloat:
		return "float"
	case KindBool:
		return "bool"
	case KindNull, KindImplicitNull:
		return "null"
	case KindInf:
		return "infinity"
	case KindNaN:
		return "nan"
	case KindTag:
		return "tag"
	case KindAnchor:
		return "anchor"
	case KindAlias:
		return "alias"
	case KindMergeKey:
		return "mergekey"
	case KindComplexKey:
		return "mappingkey"
	}
	return "unknown"
}

// Style is how a KindString scalar was written.
type Style uint8

// The styles of a string scalar. Only a Plain scalar can be a number.
const (
	Plain        Style = iota // unquoted
	DoubleQuoted              // "text"
	SingleQuoted              // 'text'
)
