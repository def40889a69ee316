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
invoices.notify)
	# A transient failure: the first attempt fails (retries: 0, so it is
	# dead-lettered); a replay (relay dlq replay, or the console) is
	# attempt 2 and goes through.
	if [ "${RELAY_ATTEMPT:-1}" -le 1 ]; then
		echo "billing: mail relay busy (demo failure); a replay goes through" >&2
		exit 75
	fi
	echo "mailed invoice notice: $event"
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
