# Handlers of the ledger app; RELAY_HANDLER selects one. The event JSON is
# on stdin. busybox has no JSON parser, so fields are picked out with sed,
# which is good enough for a demo.
set -eu

event=$(cat)
field() { # field NAME: first string or number value of "NAME" in the event
	printf '%s' "$event" | sed -n 's/.*"'"$1"'"[[:space:]]*:[[:space:]]*"\{0,1\}\([^",}]*\).*/\1/p' | head -n 1
}

case "${RELAY_HANDLER:-}" in
payments.capture)
	echo "captured payment $(field id) of customer $(field customer_id): $(field amount) EUR (message ${RELAY_MESSAGE_ID:-none})"
	;;
search.reindex)
	echo "search entry of customer $(field id) rebuilt: $(field name)"
	;;
*)
	echo "ledger: unknown handler $RELAY_HANDLER" >&2
	exit 127
	;;
esac
