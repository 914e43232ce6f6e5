-- The units a claim spent (docs/design.md rule 11): the provider's new
-- theoretical arrival time, committed with the hand-outs. Sent as text in
-- the claim's COMMIT round trip: {tat} and {provider} are literals.
UPDATE providers SET tat = {tat} WHERE name = {provider}
