# Handlers of the billing app; they fail on purpose (see template.yaml).
event=$(cat)

case "${RELAY_HANDLER:-}" in
invoices.charge)
	echo "charging invoice: $event"
	echo "billing: payment provider unreachable (demo failure), giving up" >&2
	exit 3
	;;
invoices.refund)
	echo "billing: refund rejected on attempt $RELAY_ATTEMPT (demo failure)" >&2
	exit 3
	;;
invoices.reconcile)
	echo "reconciling a large invoice, this takes a while..."
	sleep 30 # longer than the rule's 1s timeout: Relay kills it
	;;
*)
	echo "billing: unknown handler $RELAY_HANDLER" >&2
	exit 127
	;;
esac
