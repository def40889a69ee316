# Handlers of the shop test app; RELAY_HANDLER selects one.
event=$(cat)
case "$RELAY_HANDLER" in
orders.audit)
	echo "audited $event"
	;;
orders.charge)
	# Only stderr: lines of two pipes would interleave unpredictably.
	echo "card declined (message ${RELAY_MESSAGE_ID:-none}, attempt $RELAY_ATTEMPT)" >&2
	exit 3
	;;
refunds.run)
	echo "refunded (message ${RELAY_MESSAGE_ID:-none}, attempt $RELAY_ATTEMPT)"
	;;
*)
	echo "shop: unknown handler $RELAY_HANDLER" >&2
	exit 127
	;;
esac
