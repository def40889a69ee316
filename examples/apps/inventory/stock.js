// CommonJS: require() finds ms in the dependency image (NODE_PATH).
const ms = require("ms");

exports.low = (event) => {
  const item = event.new_image;
  const wait = ms(item.restock_in || "2 days");
  console.log(`stock of ${item.sku} is low (${item.quantity} left): restock in ${ms(wait, { long: true })} (${wait} ms)`);
};
